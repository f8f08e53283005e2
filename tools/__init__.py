"""Build tools of the repository (not shipped): ``python -m tools.gen_config_doc``."""
