"""Research tooling: fedstudy (variants x seeds, claims, tables) and fedeval."""
