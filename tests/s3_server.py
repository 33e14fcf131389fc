"""A real S3 server for tests: moto's server mode in a subprocess on loopback, with IAM auth on.

:func:`start` runs ``python -m moto.server`` on a free port, makes an IAM user with a policy that
allows everything, and returns its endpoint and access key; every later request must be signed
with that key (``INITIAL_NO_AUTH_ACTION_COUNT``), so a wrong credential is refused as AWS refuses it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass


@dataclass
class S3Server:
    endpoint: str
    key_id: str
    secret: str
    proc: subprocess.Popen

    def env(self) -> dict[str, str]:
        """The environment variables boto and s3fs read: this server and its user's key."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.key_id,
                "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_DEFAULT_REGION": "us-east-1"}

    def make_bucket(self, name: str) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.key_id,
                     aws_secret_access_key=self.secret, region_name="us-east-1").create_bucket(Bucket=name)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start() -> S3Server:
    """Start moto's S3 server (IAM auth enforced after the user is made) and wait until it answers."""
    import boto3

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}  # create_user, create_access_key, put_user_policy
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(endpoint + "/moto-api/data.json", timeout=2).read()  # not counted as an action
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto server did not start on {endpoint}") from None
            time.sleep(0.1)
    iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bootstrap",
                       aws_secret_access_key="bootstrap")
    iam.create_user(UserName="cptkit")
    key = iam.create_access_key(UserName="cptkit")["AccessKey"]
    iam.put_user_policy(UserName="cptkit", PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    return S3Server(endpoint, key["AccessKeyId"], key["SecretAccessKey"], proc)


if __name__ == "__main__":  # python tests/s3_server.py: a server for trying things by hand (docs/retrieve.md)
    import signal

    srv = start()
    for k, v in srv.env().items():
        print(f"export {k}={v}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while srv.proc.poll() is None:
            time.sleep(0.5)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        srv.stop()
