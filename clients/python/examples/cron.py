"""A cron script that every host runs, and that must not run twice at once:
the host that takes the lock for the slot does the work, the others exit.

    # In the crontab of every host:
    0 6 * * * LOCKD_URL=http://lockd:8080 python3 /opt/report/cron.py

The slot is the day (UTC), or ``CRON_SLOT`` when set. ``LOCKD_URL`` (default
``http://127.0.0.1:8080``) and ``LOCKD_API_KEY`` configure the client. Exit
0 when the report was written or another host has the lock, 1 when the
lock was lost mid-report. (For work that must run once per slot even when
the hosts run one after the other, use ``client.once`` keyed by the slot.)
"""

from __future__ import annotations

import os
import socket
import sys
from datetime import datetime, timezone

from lockd import Lease, LeaseLost, LockHeld, Lockd


def write_report(lease: Lease) -> str:
    """The work: pass ``lease.fence`` to the storage you write, so that it can
    refuse a writer whose lease lapsed, and stop if ``lease.lost``."""
    if lease.lost:
        raise RuntimeError("lease lost before the report was written")
    return f"report written under fence {lease.fence}"


def main() -> int:
    slot = os.environ.get("CRON_SLOT") or datetime.now(timezone.utc).date().isoformat()
    url = os.environ.get("LOCKD_URL", "http://127.0.0.1:8080")
    with Lockd(url, api_key=os.environ.get("LOCKD_API_KEY")) as client:
        try:
            with client.lock(f"cron:nightly-report:{slot}", ttl_ms=30_000, owner=socket.gethostname()) as lease:
                print(write_report(lease), flush=True)
        except LockHeld as e:
            print(f"another host runs it; free in at most {e.retry_after_ms} ms", flush=True)
        except LeaseLost as e:
            print(f"the lock was lost mid-report: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
