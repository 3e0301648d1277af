"""The annotations the agent writes of one `Topology`: the JSON for programs, the matrix for people.

Pure: the publisher adds the `owned` annotation, and nothing here reads or writes the cluster.
"""

from reporter.schema import keys
from reporter.schema.codec import encode
from reporter.schema.matrix import describe_matrix
from reporter.schema.model import Topology


def annotations(topology: Topology, prefix: str = keys.DEFAULT_PREFIX) -> dict[str, str]:
    """The `topology` and `matrix` annotations (the publisher adds `owned`)."""
    return {
        keys.key(prefix, keys.TOPOLOGY): encode(topology),
        keys.key(prefix, keys.MATRIX): describe_matrix(topology),
    }
