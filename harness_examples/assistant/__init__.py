"""Everyday assistant: the natural-language tool-choice family (a real instruct model's toolbox):
nine tools over cities, products and people, asked in plain English."""
