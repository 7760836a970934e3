"""Packaged default configurations (data files; see `config.default_demo_config_path`)."""
