"""Flower edges of a site: mods (signed instructions, secure aggregation, array exchange), virtual sites."""
