"""The notebooks' toolkit: explorers, pictures, plots and the anatomy of a step.

Built on the engine (``cglab``), never imported by it: the engine and its tests stand without it.
"""
