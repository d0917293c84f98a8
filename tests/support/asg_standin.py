"""What moto's Auto Scaling lacks, served in front of it.

moto 5.2.5 answers `DescribeScalingActivities` with an empty list, has no
`CompleteLifecycleAction`, and terminates an instance at once even when the
group has a termination lifecycle hook (real groups hold it in
`Terminating:Wait` until the hook is completed or times out). This proxy
sits between boto3 and moto's server on 127.0.0.1 and serves those in the
real API's XML shapes; every other request goes through to moto untouched:

- `DescribeScalingActivities`: the activities a test scripted per group
  (`activities[group]`), newest first as AWS returns them;
- `TerminateInstanceInAutoScalingGroup` on a group with an
  `autoscaling:EC2_INSTANCE_TERMINATING` hook: moto terminates (and launches
  the successor), and the instance is held: `DescribeAutoScalingGroups`
  lists it in `Terminating:Wait` until it is completed;
- `CompleteLifecycleAction`: releases a held instance and records the call;
  for an instance not held, AWS's `ValidationError`;
- a group `starve`d cannot launch (AWS out of capacity): instances moto
  launches after it are left out of `DescribeAutoScalingGroups`, so the
  group stays below its desired capacity, as a group whose launches fail.
"""

from __future__ import annotations

import http.client
import threading
import uuid
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import boto3

NS = "http://autoscaling.amazonaws.com/doc/2011-01-01/"
TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
ET.register_namespace("", NS)


def activity(group: str, status: str, message: str = "", *, at: datetime | None = None,
             description: str = "Launching a new EC2 instance") -> dict:
    """One scaling activity as AWS reports it."""
    at = at or datetime.now(UTC)
    return {"ActivityId": str(uuid.uuid4()), "AutoScalingGroupName": group,
            "Description": f"{description}.  Status Reason: {message}" if message
            else f"{description}: i-0{uuid.uuid4().hex[:16]}",
            "Cause": f"At {at:%Y-%m-%dT%H:%M:%SZ} an instance was started in response to a "
                     "difference between desired and actual capacity, increasing the capacity "
                     "from 2 to 3.",
            "StartTime": at, "EndTime": at, "StatusCode": status, "StatusMessage": message,
            "Progress": 100, "Details": "{}"}


def insufficient_capacity(group: str, at: datetime | None = None) -> dict:
    return activity(group, "Failed", (
        "We currently do not have sufficient p5.48xlarge capacity in the Availability Zone "
        "you requested (us-east-1a). Our system will be working on provisioning additional "
        "capacity. You can currently get p5.48xlarge capacity by not specifying an "
        "Availability Zone in your request or choosing us-east-1b. Launching EC2 instance "
        "failed."), at=at)


def _time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class AsgStandIn:
    """The proxy; `url` goes where moto's would (`endpoint_url`)."""

    def __init__(self, moto_url: str):
        self.moto = urlsplit(moto_url)
        self.asg = boto3.client("autoscaling", region_name="us-east-1", endpoint_url=moto_url)
        self.activities: dict[str, list[dict]] = {}
        self.held: dict[str, str] = {}  # instance id -> group, in Terminating:Wait
        self.completed: list[dict] = []
        self.starved: dict[str, set[str]] = {}  # group -> the instances it had
        self.actions: list[str] = []
        self._lock = threading.Lock()
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                standin.handle(self, body)

            do_GET = do_POST

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> AsgStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- requests -----------------------------------------------------------------
    def handle(self, request, body: bytes) -> None:
        form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
        action = form.get("Action", "") if "autoscaling" in request.headers.get(
            "Authorization", "") else ""
        with self._lock:
            self.actions.append(action or request.headers.get("X-Amz-Target", "other"))
        if action == "DescribeScalingActivities":
            return self._reply(request, 200, self._activities(form))
        if action == "CompleteLifecycleAction":
            return self._complete(request, form)
        group = None
        if action == "TerminateInstanceInAutoScalingGroup":
            group = self._hooked_group(form["InstanceId"])
        status, headers, data = self._forward(request, body)
        if group and status == 200:
            with self._lock:
                self.held[form["InstanceId"]] = group
        if action == "DescribeAutoScalingGroups" and status == 200:
            data = self._with_held(data)
        self._reply(request, status, data, headers)

    def _forward(self, request, body: bytes):
        conn = http.client.HTTPConnection(self.moto.hostname, self.moto.port, timeout=30)
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        conn.request(request.command, request.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, resp.getheaders(), data

    def _reply(self, request, status: int, data: bytes, headers=()) -> None:
        request.send_response(status)
        sent = False
        for key, value in headers:
            if key.lower() in ("content-length", "transfer-encoding", "connection",
                               "server", "date"):
                continue
            sent = sent or key.lower() == "content-type"
            request.send_header(key, value)
        if not sent:
            request.send_header("Content-Type", "text/xml")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    def starve(self, group: str) -> None:
        """From now on the group launches nothing (until `feed`)."""
        found = self.asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])
        self.starved[group] = {i["InstanceId"] for i in found["AutoScalingGroups"][0]["Instances"]}

    def feed(self, group: str) -> None:
        self.starved.pop(group, None)

    # --- what moto lacks ------------------------------------------------------------
    def _hooked_group(self, iid: str) -> str | None:
        found = self.asg.describe_auto_scaling_instances(InstanceIds=[iid])[
            "AutoScalingInstances"]
        if not found:
            return None
        group = found[0]["AutoScalingGroupName"]
        hooks = self.asg.describe_lifecycle_hooks(AutoScalingGroupName=group)["LifecycleHooks"]
        return group if any(h["LifecycleTransition"] == TERMINATING for h in hooks) else None

    def _activities(self, form: dict) -> bytes:
        group = form.get("AutoScalingGroupName", "")
        limit = int(form.get("MaxRecords", 100))
        rows = sorted(self.activities.get(group, []), key=lambda a: a["StartTime"],
                      reverse=True)[:limit]
        root = ET.Element(f"{{{NS}}}DescribeScalingActivitiesResponse")
        result = ET.SubElement(root, f"{{{NS}}}DescribeScalingActivitiesResult")
        members = ET.SubElement(result, f"{{{NS}}}Activities")
        for row in rows:
            member = ET.SubElement(members, f"{{{NS}}}member")
            for key, value in row.items():
                ET.SubElement(member, f"{{{NS}}}{key}").text = (
                    _time(value) if isinstance(value, datetime) else str(value))
        self._metadata(root)
        return ET.tostring(root, xml_declaration=True, encoding="utf-8")

    def _complete(self, request, form: dict) -> None:
        iid = form.get("InstanceId", "")
        with self._lock:
            group = self.held.get(iid)
            ours = group is not None and group == form.get("AutoScalingGroupName")
            if ours:
                del self.held[iid]
                self.completed.append(form)
        if not ours:
            root = ET.Element(f"{{{NS}}}ErrorResponse")
            error = ET.SubElement(root, f"{{{NS}}}Error")
            ET.SubElement(error, f"{{{NS}}}Type").text = "Sender"
            ET.SubElement(error, f"{{{NS}}}Code").text = "ValidationError"
            ET.SubElement(error, f"{{{NS}}}Message").text = (
                f"No active Lifecycle Action found with instance ID {iid}")
            ET.SubElement(root, f"{{{NS}}}RequestId").text = str(uuid.uuid4())
            return self._reply(request, 400, ET.tostring(root, encoding="utf-8"))
        root = ET.Element(f"{{{NS}}}CompleteLifecycleActionResponse")
        ET.SubElement(root, f"{{{NS}}}CompleteLifecycleActionResult")
        self._metadata(root)
        self._reply(request, 200, ET.tostring(root, xml_declaration=True, encoding="utf-8"))

    def _with_held(self, data: bytes) -> bytes:
        with self._lock:
            held = dict(self.held)
        if not held and not self.starved:
            return data
        root = ET.fromstring(data)
        groups = [g for g in root.iter(f"{{{NS}}}member")
                  if g.find(f"{{{NS}}}AutoScalingGroupName") is not None
                  and g.find(f"{{{NS}}}Instances") is not None]
        for group in groups:
            name = group.find(f"{{{NS}}}AutoScalingGroupName")
            instances = group.find(f"{{{NS}}}Instances")
            allowed = self.starved.get(name.text)
            if allowed is not None:
                for member in list(instances):
                    if member.findtext(f"{{{NS}}}InstanceId") not in allowed:
                        instances.remove(member)
            for iid, owner in held.items():
                if owner != name.text:
                    continue
                member = ET.SubElement(instances, f"{{{NS}}}member")
                for key, value in (("InstanceId", iid), ("AvailabilityZone", "us-east-1a"),
                                   ("LifecycleState", "Terminating:Wait"),
                                   ("HealthStatus", "Healthy"),
                                   ("ProtectedFromScaleIn", "false")):
                    ET.SubElement(member, f"{{{NS}}}{key}").text = value
        return ET.tostring(root, xml_declaration=True, encoding="utf-8")

    @staticmethod
    def _metadata(root) -> None:
        meta = ET.SubElement(root, f"{{{NS}}}ResponseMetadata")
        ET.SubElement(meta, f"{{{NS}}}RequestId").text = str(uuid.uuid4())
