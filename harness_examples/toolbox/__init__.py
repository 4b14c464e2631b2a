"""Toolbox: the learning benchmark's task family, where choosing the tool (action) and filling
its argument (args) are separate skills, optionally behind a planner that must delegate."""
