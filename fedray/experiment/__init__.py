"""One run, from its config to its last round: the config checked against everything registered
before anything runs (`validation`), and the round loop (`loop.execute`), which loads the data,
builds the federation, runs the algorithm's rounds, evaluates, checkpoints, writes the results
and yields the events a caller prints.

May import: `fedray.algorithms` and every layer below it.
"""
