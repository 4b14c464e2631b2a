"""A deterministic fictional world for offline multi-hop search tasks.

Countries, cities, companies and people with made-up names; one document per entity; and
questions that need 2 hops (person → city → country, person → company → city) or 3 hops
(person → city → country → capital, person → company → city → country). The same seed
always gives the same corpus and questions, and no fact can be known without searching.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kl", "st", "tr", "qu"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ou", "y"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "x", "m"]
_OCCUPATIONS = ["painter", "engineer", "poet", "chemist", "sculptor", "navigator", "botanist", "composer"]
_INDUSTRIES = ["shipbuilding", "textiles", "glassware", "clockmaking", "mining", "publishing"]


@dataclass(frozen=True)
class Doc:
    id: str
    title: str
    text: str


@dataclass(frozen=True)
class QA:
    id: str
    question: str
    answers: list[str]
    meta: dict = field(default_factory=dict, hash=False, compare=False)


class _Names:
    def __init__(self, rng: random.Random) -> None:
        self.rng, self.used = rng, set()

    def __call__(self, syllables: int) -> str:
        while True:
            name = "".join(self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)
                           for _ in range(syllables)).capitalize()
            if name not in self.used and len(name) > 3:
                self.used.add(name)
                return name


def generate_world(seed: int = 0, n_countries: int = 4, cities_per_country: int = 3, n_companies: int = 6,
                   n_people: int = 16) -> tuple[list[Doc], list[QA]]:
    """The corpus and its questions (two per person: a 2-hop and a 3-hop one, alternating kinds)."""
    rng = random.Random(seed)
    name = _Names(rng)
    countries = [name(3) for _ in range(n_countries)]
    city_country = {name(2): c for c in countries for _ in range(cities_per_country)}
    cities = list(city_country)
    capital = {c: next(city for city, cc in city_country.items() if cc == c) for c in countries}
    company_city = {name(2) + " " + rng.choice(["Works", "Guild", "Company", "Foundry"]): rng.choice(cities)
                    for _ in range(n_companies)}
    companies = list(company_city)
    people = {f"{name(2)} {name(2)}": (rng.choice(cities), rng.choice(companies), rng.choice(_OCCUPATIONS))
              for _ in range(n_people)}

    docs = [Doc(f"country-{c}", c, f"{c} is a country. The capital of {c} is {capital[c]}.") for c in countries]
    docs += [Doc(f"city-{city}", city, f"{city} is a city in the country of {country}.")
             for city, country in city_country.items()]
    docs += [Doc(f"company-{co}", co, f"{co} is a {rng.choice(_INDUSTRIES)} company headquartered in the city of {city}.")
             for co, city in company_city.items()]
    docs += [Doc(f"person-{p}", p, f"{p} is a {job} who was born in the city of {city}. {p} works for {co}.")
             for p, (city, co, job) in people.items()]

    qas: list[QA] = []
    for i, (p, (city, co, _)) in enumerate(people.items()):
        if i % 2 == 0:
            two = (f"In which country was {p} born?", city_country[city], [f"person-{p}", f"city-{city}"])
            three = (f"What is the capital of the country where {p} was born?", capital[city_country[city]],
                     [f"person-{p}", f"city-{city}", f"country-{city_country[city]}"])
        else:
            hq = company_city[co]
            two = (f"In which city is the company that {p} works for headquartered?", hq,
                   [f"person-{p}", f"company-{co}"])
            three = (f"In which country is the headquarters of the company that {p} works for?", city_country[hq],
                     [f"person-{p}", f"company-{co}", f"city-{hq}"])
        for hops, (question, answer, support) in ((2, two), (3, three)):
            qas.append(QA(f"world{seed}-{len(qas)}", question, [answer], {"hops": hops, "support": support}))
    return docs, qas
