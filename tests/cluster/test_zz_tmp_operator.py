import pytest
pytestmark = pytest.mark.cluster

def test_real_operator(operator, kubectl, wait_for):
    assert operator.running
    print(kubectl("get", "crd").stdout)
    print(operator.logs()[-3000:])
    operator.kill()
    assert not operator.running
    operator.restart()
    assert operator.running
