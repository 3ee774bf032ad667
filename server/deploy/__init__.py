"""Operator tools: fedserver, admin (certificates, site keys), resume, the nginx front, the engines and the local launcher."""
