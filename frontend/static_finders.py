"""Serves plotly.js from the plotly Python package as frontend/plotly.min.js.

The machines have no internet, so no CDN; and the 4 MB bundle already ships
in the installed wheel, so it is found there rather than copied into the repo.
collectstatic and whitenoise (with finders) both pick it up through list().
"""

from pathlib import Path

import plotly
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PACKAGE_DATA = Path(plotly.__file__).resolve().parent / "package_data"
NAME = "plotly.min.js"
PREFIX = "frontend"
PUBLIC_PATH = f"{PREFIX}/{NAME}"


class PlotlyFinder(BaseFinder):
    def __init__(self, *args, **kwargs):
        self.storage = FileSystemStorage(location=str(PACKAGE_DATA))
        self.storage.prefix = PREFIX

    def check(self, **kwargs):
        return []

    def find(self, path, find_all=False, **kwargs):
        if path != PUBLIC_PATH:
            return []
        found = str(PACKAGE_DATA / NAME)
        return [found] if find_all else found

    def list(self, ignore_patterns):
        yield NAME, self.storage
