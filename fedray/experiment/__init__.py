"""One run, from its config to its last round: the config checked against everything registered
before anything runs (`checks`), what the layers below get from it field by field (`local`:
the `Task`, the engine decision, the in-process federation), a run held to the data it read
(`same_data`), and the round loop (`loop.execute`), which loads the data, builds the federation,
runs the algorithm's rounds, evaluates, checkpoints, writes the results and yields the events a
caller prints.

May import: `fedray.algorithms` and every layer below it.
"""
