"""Which pools a NodePool event may reconcile (pure part of the kopf glue)."""

import pytest

from tidegate.operator.handlers import watched

pytestmark = pytest.mark.unit


def test_a_namespaced_operator_leaves_other_namespaces_node_pools_alone() -> None:
    # kopf watches cluster-scoped NodePools everywhere even under --namespace: the handler must filter.
    assert watched("ml", ())
    assert watched("ml", ("ml", "other"))
    assert not watched("team-b", ("ml",))
    assert watched("team-a", ("team-*",))
    assert not watched("prod", ("team-*", "!team-x"))
