"""DukeMTMC-reID (Ristani et al., ECCVW 2016; Zheng et al., ICCV 2017).

Layout: ``<root>/DukeMTMC-reID/{bounding_box_train,query,bounding_box_test}/``, names like
``0005_c2_f0046985.jpg`` (pid 0005, camera 2 of 8): the Market-1501 scheme, read by the same
code (torchreid ``DukeMTMCreID``). ``root`` may be the ``DukeMTMC-reID`` folder or its parent.
The set is withdrawn upstream; only existing copies (or synthetic replicas) can be read.
"""

from __future__ import annotations

from common.datasets.market1501 import Market1501


class DukeMTMCreID(Market1501):
    """Reader of the DukeMTMC-reID layout (16,522 train / 2,228 query / 17,661 gallery images)."""

    dataset_dir = "DukeMTMC-reID"
    name = "dukemtmc"
    max_camid = 7  # cameras c1..c8
