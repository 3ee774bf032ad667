# Docker compose targets (docker/compose.yaml). Include from the Makefile: `include docker/compose.mk`.
#   make compose-demo          the CPU demo: build, secrets and synthetic data made in a container,
#                              six rounds, one result line (docker/compose-demo.sh); GPU=1: the CUDA image;
#                              TASK=fedfr: the FedFR demo, personalised evaluation at the sites
#   make compose-up            your deployment (docker/README.md), sites on CPU
#   make compose-up GPU=1      the CUDA image, GPUs reserved per site (docker/compose.gpu.yaml)
#   make compose-down          stop and remove the demo (containers, volumes, docker/demo) and the
#                              deployment's containers (its volumes are kept; VOLUMES=1 removes them)
# The Compose command is detected (the `docker compose` plugin, else `docker-compose`, by
# docker/compose-cli.sh); DOCKER_COMPOSE=... names another.
COMPOSE_FILES := -f docker/compose.yaml $(if $(GPU),-f docker/compose.gpu.yaml)
COMPOSE_ENV := $(if $(GPU),SITE_DEVICE=cuda)
DOCKER_COMPOSE ?= $(shell docker/compose-cli.sh)
COMPOSE = $(COMPOSE_ENV) $(DOCKER_COMPOSE) -p fedreid $(COMPOSE_FILES)

.PHONY: compose-demo compose-up compose-down
compose-demo:  ## the demo in docker compose: six rounds on synthetic data, then one result line
	@DOCKER_COMPOSE="$(DOCKER_COMPOSE)" GPU="$(GPU)" TASK="$(TASK)" docker/compose-demo.sh up

compose-up:  ## build the image, start the coordinator and 4 sites, wait for the run; exit code = the run's
	@test -n "$(DOCKER_COMPOSE)"
	$(COMPOSE) up --build --detach
	@echo "compose-up: waiting for the run ($(DOCKER_COMPOSE) -p fedreid -f docker/compose.yaml logs -f to follow)"
	@code=$$(docker wait $$($(COMPOSE) ps --all --quiet superlink)); \
	  echo "compose-up: coordinator exited with code $$code (outputs in the fedreid_runs volume)"; exit $$code

compose-down:  ## stop and remove the demo and the federation's containers and network
	@DOCKER_COMPOSE="$(DOCKER_COMPOSE)" GPU="$(GPU)" TASK="$(TASK)" docker/compose-demo.sh down
	@if [ -n "$$(docker ps -aq --filter label=com.docker.compose.project=fedreid)$(VOLUMES)" ]; then \
	  $(COMPOSE) down $(if $(VOLUMES),--volumes); fi
