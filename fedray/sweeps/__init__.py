"""Many runs: a sweep file expanded into runs and checked (`sweep_file`), the scheduler that starts
them through a launcher as resources allow (`scheduler`), and packs, several runs trained together
in one worker (`pack`).

May import: `fedray.experiment` and every layer below it.
"""
