"""Query filters shared by the API's lists."""

import django_filters
from django import forms
from drf_spectacular.utils import extend_schema_field

# Row ids are bigints: a number past one is no id, and must be a 400, not an
# overflow in the database driver.
MAX_ID = 2**63 - 1


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": MAX_ID})
class IdFilter(django_filters.NumberFilter):
    """Rows whose foreign key is this id: a whole number from 1 to MAX_ID,
    anything else a 400 naming the parameter."""

    field_class = forms.IntegerField

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", MAX_ID)
        super().__init__(*args, **kwargs)
