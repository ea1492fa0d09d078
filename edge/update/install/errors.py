"""The installer's errors, each with the exit status of the command that meets it.

    InstallError                  (exit 3) something failed midway; the message says what is left
    ├── Refused                   (exit 1) the archive is not accepted; the live slot is untouched
    │                                      and nothing is left behind (`kind` says which check;
    │                                      `host`: a host path, user or unit limit the bundle names
    │                                      is outside what the installer allows, host_paths.py)
    ├── NotReady                  (exit 2) the device or the command line is not ready for it: no
    │                                      trusted key, no such file, `current` is not ours,
    │                                      another installer runs, nothing to roll back to, a
    │                                      host directory the bundle names is a symlink, leads
    │                                      out of the root, or would be refused at the start
    └── RestartFailed             (exit 4) the switch is done and recorded, but `systemctl restart
                                           edge` failed: the slot is on trial, and the trial's
                                           hooks roll it back if the unit keeps failing

``recoverable`` says whether running the same command again can succeed without changing the
archive: a Refused archive stays refused; a device that is NotReady can be made ready; a failure
midway (an I/O error, a full disk the statvfs did not foresee) may pass on a second run.
"""

from __future__ import annotations

__all__ = ["InstallError", "Refused", "NotReady", "RestartFailed", "REFUSAL_KINDS"]

# Refused.kind, in the order install checks them: all but "member" before anything is written
# ("member" too when the member is edge-bundle.json or the unit's drop-in, read by the "host" check).
REFUSAL_KINDS = ("archive", "signature", "manifest", "compatibility", "space", "host", "member")


class InstallError(RuntimeError):
    exit_code = 3
    recoverable = True


class Refused(InstallError):
    """The archive fails a check. ``kind``: one of :data:`REFUSAL_KINDS`."""

    exit_code = 1
    recoverable = False

    def __init__(self, kind: str, message: str) -> None:
        assert kind in REFUSAL_KINDS, kind
        super().__init__(message)
        self.kind = kind


class NotReady(InstallError):
    exit_code = 2
    recoverable = True


class RestartFailed(InstallError):
    exit_code = 4
    recoverable = True
