"""What a run is: its config keys (`keys`: `Config`, every key with its default, meaning and roles,
and the lists of keys derived from the roles), what a key is (`roles`: its section and roles,
declared once with the key), the run id's one versioned rule (`run_ids`), the parts of it a layer
reads (`sections`: the data layer's `DataSection`), an algorithm's
hyperparameters (`hparams`), typed values from YAML (`coercion`), plug-ins (`plugins`)
the derived random streams (`seeding`) and the notes a process says once (`notes`).

May import: the standard library, PyYAML, numpy and torch (`seeding`); nothing else of fedray (every other layer reads
a config). Checking a config against what is registered (algorithms, datasets, models) is
`fedray.experiment.checks`'s.
"""

from fedray.config.keys import Config, ConfigError

__all__ = ["Config", "ConfigError"]
