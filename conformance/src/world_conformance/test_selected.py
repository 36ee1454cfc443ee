"""The suite against the World named on the command line, for any installed backend::

pytest --pyargs world_conformance --world NAME [--world-url URL]
"""

from world_conformance import WorldContract


class TestSelectedWorld(WorldContract):
    """Runs every contract against ``--world``; skipped when no ``--world`` is given."""
