"""Recipes: runnable assemblies of spherenet's parts (train, sample, compare, analyze)."""
