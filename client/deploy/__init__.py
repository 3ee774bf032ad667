"""The site operator's tools: fedclient, key generation, the coordinator wait, site keys."""
