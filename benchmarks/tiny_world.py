"""The tiny synthetic world and the simulation settings the overhead benchmarks share.

``DATA``: the world's server.demos.fedsim data arguments; ``WORK``: server.demos.fedsim arguments of a world where a round is almost all overhead (4 identities a site,
32x16 images, no local expert, no evaluation); ``SIM``: the simulation engine, one core a site.
"""

DATA = ["--train-ids", "4", "--images-per-id", "4", "--target-ids", "3"]  # 4 identities x 4 images a site
WORK = [
    *DATA,
    "model.height=32",
    "model.width=16",
    "train.batch_size=4",
    "train.local_expert=false",
    "train.unit=step",  # --steps local steps, whatever the site's image count (the loader cycles)
    "eval.every=0",
    "train.threads=1",
    "wait_for_sites_s=300",
    "round_timeout_s=900",
]
SIM = ["--engine", "simulation", "engine.num_cpus=1", "engine.object_store_fraction=0.05"]
