"""Tools for fedray's developers, not for its users: `same_numbers` (every algorithm's numbers at a
git revision against the working tree, bit for bit) and `import_graph` (the house's figures:
imports, layers, how far the config reaches)."""
