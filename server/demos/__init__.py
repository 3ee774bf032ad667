"""Demos: fedsim, its synthetic worlds, the FedReID and FedFR demos and the docker compose demo set-up."""
