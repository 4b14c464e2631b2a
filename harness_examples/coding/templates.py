"""The function templates of the coding family: each a correct body, a plausible bug, and an
input sampler. Expected values are never written by hand: the generator runs the correct body
(tasks.py), so a task's reference solution passes its tests by construction, and it keeps a bug
only where the bug fails at least one visible and one hidden case."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "zeta", "theta", "lambda")


@dataclass(frozen=True)
class Template:
    family: str
    names: tuple[str, ...]  # function names to choose from
    modules: tuple[str, ...]  # module names to choose from
    params: str  # the parameter list
    doc: str  # the docstring: the behaviour, in words ({k}: the template's constants)
    fixed: str  # the correct body (indented 4), may use the constants
    broken: str  # the bug
    consts: Callable[[random.Random], dict]  # the constants baked into the code
    sample: Callable[[random.Random, dict], tuple]  # one call's arguments


def _ints(rng: random.Random, n: int, lo: int = -20, hi: int = 20) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def _text(rng: random.Random, n: int) -> str:
    words = [rng.choice(WORDS) for _ in range(n)]
    return " ".join(w.upper() if rng.random() < 0.3 else w.capitalize() if rng.random() < 0.3 else w for w in words)


def _clamp_args(rng, c):
    lo = rng.randint(-10, 5)
    return (rng.randint(-30, 30), lo, lo + rng.randint(0, 15))


def _label_consts(rng):
    a, b = rng.sample([2, 3, 5, 7], 2)
    wa, wb = rng.sample(["Fizz", "Buzz", "Bang", "Zip", "Zap", "Pop"], 2)
    return {"a": a, "b": b, "wa": wa, "wb": wb}


def _pal_args(rng, c):
    core = rng.choice(["racecar", "level", "noon", "step on no pets", "abcd", "python", "refer", "never odd or even"])
    if rng.random() < 0.5:
        core = core.replace(" ", rng.choice([", ", " - ", "! "]))
    return ("".join(ch.upper() if rng.random() < 0.3 else ch for ch in core),)


def _pairs_consts(rng):
    return {"sep": rng.choice([";", ",", "|"]), "eq": rng.choice(["=", ":"])}


def _pairs_args(rng, c):
    keys = rng.sample(["x", "y", "n", "size", "depth", "count", "rate", "w"], rng.randint(1, 4))
    return (c["sep"].join(f"{k}{rng.choice(['', ' '])}{c['eq']}{rng.choice(['', ' '])}{rng.randint(-9, 99)}"
                          for k in keys),)


def _words_args(rng, c):
    return (_text(rng, rng.randint(3, 12)), rng.randint(1, 3))


TEMPLATES: tuple[Template, ...] = (
    Template("clamp", ("clamp", "bound", "limit_to"), ("numbers", "bounds"), "x, lo, hi",
             "Return x limited to the closed range [lo, hi] (lo <= hi).",
             "    return max(lo, min(x, hi))", "    return min(lo, max(x, hi))",
             lambda rng: {}, _clamp_args),
    Template("running_total", ("running_total", "cumulative_sum", "prefix_sums"), ("series", "sums"), "xs",
             "Return the list of running totals of xs: element i is xs[0] + ... + xs[i].",
             "    out, total = [], 0\n    for x in xs:\n        total += x\n        out.append(total)\n    return out",
             "    out, total = [], 0\n    for x in xs[1:]:\n        total += x\n        out.append(total)\n    return out",
             lambda rng: {}, lambda rng, c: (_ints(rng, rng.randint(0, 6)),)),
    Template("count_vowels", ("count_vowels", "vowel_count"), ("text", "letters"), "s",
             "Return how many characters of s are vowels ({vowels}), upper or lower case.",
             "    return sum(1 for ch in s.lower() if ch in {vowels!r})",
             "    return sum(1 for ch in s if ch in {vowels!r})",
             lambda rng: {"vowels": rng.choice(["aeiou", "aeiouy"])}, lambda rng, c: (_text(rng, rng.randint(1, 4)),)),
    Template("label", ("label", "fizz_label", "name_number"), ("game", "labels"), "n",
             "Return {wa!r} + {wb!r} if n is a multiple of both {a} and {b}, {wa!r} if only of {a}, "
             "{wb!r} if only of {b}, else str(n).",
             "    if n % {a} == 0 and n % {b} == 0:\n        return {wa!r} + {wb!r}\n    if n % {a} == 0:\n"
             "        return {wa!r}\n    if n % {b} == 0:\n        return {wb!r}\n    return str(n)",
             "    if n % {a} == 0:\n        return {wa!r}\n    if n % {b} == 0:\n        return {wb!r}\n"
             "    if n % {a} == 0 and n % {b} == 0:\n        return {wa!r} + {wb!r}\n    return str(n)",
             _label_consts, lambda rng, c: (rng.choice([c["a"] * c["b"] * rng.randint(1, 3), rng.randint(1, 60)]),)),
    Template("palindrome", ("is_palindrome", "reads_same_backwards"), ("text", "strings"), "s",
             "Return True if s reads the same backwards, ignoring case and every character that is not a "
             "letter or digit.",
             "    kept = [ch.lower() for ch in s if ch.isalnum()]\n    return kept == kept[::-1]",
             "    kept = [ch.lower() for ch in s]\n    return kept == kept[::-1]",
             lambda rng: {}, _pal_args),
    Template("chunks", ("chunks", "batched", "split_every"), ("lists", "batching"), "xs, size",
             "Split xs into consecutive lists of `size` items; the last one may be shorter.",
             "    return [xs[i:i + size] for i in range(0, len(xs), size)]",
             "    return [xs[i:i + size] for i in range(0, len(xs) - size + 1, size)]",
             lambda rng: {}, lambda rng, c: (_ints(rng, rng.randint(0, 9), 0, 9), rng.randint(1, 4))),
    Template("unique", ("unique", "dedupe", "distinct"), ("lists", "collections_util"), "xs",
             "Return the items of xs without repeats, each where it first occurs.",
             "    seen, out = set(), []\n    for x in xs:\n        if x not in seen:\n            seen.add(x)\n"
             "            out.append(x)\n    return out",
             "    return sorted(set(xs))",
             lambda rng: {}, lambda rng, c: (_ints(rng, rng.randint(0, 8), 0, 6),)),
    Template("median", ("median", "middle_value"), ("stats", "numbers"), "xs",
             "Return the median of the non-empty list xs (the mean of the two middle values when its "
             "length is even).",
             "    s = sorted(xs)\n    mid = len(s) // 2\n    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2",
             "    s = sorted(xs)\n    return s[len(s) // 2]",
             lambda rng: {}, lambda rng, c: (_ints(rng, rng.randint(1, 7)),)),
    Template("caesar", ("caesar", "shift_letters", "rotate_text"), ("cipher", "text"), "s",
             "Shift every letter of s {k} places forward in the alphabet, wrapping from z to a and keeping "
             "its case; other characters are unchanged.",
             "    out = []\n    for ch in s:\n        if ch.isalpha() and ch.isascii():\n"
             "            base = ord('A') if ch.isupper() else ord('a')\n"
             "            ch = chr((ord(ch) - base + {k}) % 26 + base)\n        out.append(ch)\n    return ''.join(out)",
             "    out = []\n    for ch in s:\n        if ch.isalpha() and ch.isascii():\n"
             "            ch = chr((ord(ch) - ord('a') + {k}) % 26 + ord('a'))\n        out.append(ch)\n"
             "    return ''.join(out)",
             lambda rng: {"k": rng.randint(1, 25)}, lambda rng, c: (_text(rng, rng.randint(1, 3)) + rng.choice(["", "!", " 42"]),)),
    Template("pairs", ("parse_pairs", "parse_settings"), ("config", "parsing"), "text",
             "Parse text of the form 'key{eq}value{sep}key{eq}value' into a dict of str keys to int values; "
             "spaces around keys and values are ignored.",
             "    out = {{}}\n    for part in text.split({sep!r}):\n        key, value = part.split({eq!r}, 1)\n"
             "        out[key.strip()] = int(value)\n    return out",
             "    out = {{}}\n    for part in text.split({sep!r}):\n        key, value = part.split({eq!r}, 1)\n"
             "        out[key] = int(value)\n    return out",
             _pairs_consts, _pairs_args),
    Template("top_words", ("top_words", "most_common_words"), ("text", "words"), "text, k",
             "Return the k most frequent words of text, lower-cased, most frequent first; words equally "
             "frequent in alphabetical order.",
             "    counts = {{}}\n    for w in text.lower().split():\n        counts[w] = counts.get(w, 0) + 1\n"
             "    return sorted(counts, key=lambda w: (-counts[w], w))[:k]",
             "    counts = {{}}\n    for w in text.split():\n        counts[w] = counts.get(w, 0) + 1\n"
             "    return sorted(counts, key=lambda w: -counts[w])[:k]",
             lambda rng: {}, _words_args),
    Template("digit_sum", ("digit_sum", "sum_of_digits"), ("numbers", "digits"), "n",
             "Return the sum of the decimal digits of the integer n (its sign ignored).",
             "    return sum(int(d) for d in str(abs(n)))",
             "    return sum(int(d) for d in str(n) if d != '-') if n > 0 else 0",
             lambda rng: {}, lambda rng, c: (rng.randint(-99999, 99999),)),
)
