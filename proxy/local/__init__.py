"""The embedded model (`--backend local`): a token backend on transformers, with xgrammar
constrained decoding."""
