"""The notebooks' toolkit (explorers, pictures, plots): built on the engine, which never imports it."""
