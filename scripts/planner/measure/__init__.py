"""`pdcluster profile`'s measurements on this machine (torch): engine steps (`steps.py`), KV handoffs
(`handoff.py`), and the run that builds the engine, measures, fits and names the profile (`run.py`)."""
