"""What a site holds between rounds: settings, state files, held modules, loaders, the round record."""
