"""Key lookup: the simple tool-use task family of the learning benchmark (look a key up with
a tool, answer with its value)."""
