"""FedCat: model copies handed from device to device (`fedray.federation.Federation.relay`), its
grouping and DevSelect (`selection.py`). Notes: docs/algorithms/fedcat.md.
"""
