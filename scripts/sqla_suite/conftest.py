from sqlalchemy.dialects import registry  # noqa
import pytest
pytest.register_assert_rewrite("sqlalchemy.testing.assertions")
from sqlalchemy.testing.plugin.pytestplugin import *  # noqa
