"""OpenAPI descriptions of Regatta's two bearer token kinds."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from regatta import contract


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "accounts.authentication.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "bearerFormat": "rgt_…",
                "description": "A person's API token (POST /api/v1/tokens/)."}


class WorkerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "jobs.worker_api.auth.WorkerTokenAuthentication"
    name = "workerToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "bearerFormat": "rgw_<attempt>_…",
                "description": f"The per-attempt worker token, in {contract.TOKEN}."}
