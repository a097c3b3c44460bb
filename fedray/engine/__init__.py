"""One client's local work, described once and run by two engines: the description (`update`:
`LocalUpdate`, `Evaluation`, `Step`, `Batch`), what a client function sees (`client`: `Task`,
`Client`, `ClientError`), the per-client engine (`train`), the stacked engine that trains many
clients' updates as one model (`batched`) and `drive`, which runs client functions on either.

May import: `fedray.config`, `fedray.data`, `fedray.models`, `fedray.storage`, `fedray.params`.
"""
