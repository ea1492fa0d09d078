"""Build-host side of the OCI bundle: trace a boot, lay out the rootfs, write config.json.

``image/build_bundle.py`` (``edge-bundle``) drives these modules:

* ``trace``: boot to READY under a recorder (``_trace_hook.py``), exercise, stop;
* ``rootfs``: copy the traced files at their host paths, the model package, /etc;
* ``oci_config``: config.json for runc 1.1 (OCI runtime spec 1.0.2);
* ``cdi``: merge a CDI spec's device nodes, mounts, env, hooks and groups;
* ``seccomp``: the syscall allowlist;
* ``progress``: the progress line.
"""
