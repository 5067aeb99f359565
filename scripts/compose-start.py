"""Starts a compose project's containers in the order their depends_on
conditions say, for scripts/compose.sh.

podman-compose creates the containers (`up --no-start --no-deps`), and this
starts them. podman-compose cannot honour the file's conditions on podman
4.3: it skips every `service_healthy` condition below podman 4.6 (whose
`podman wait --condition=healthy` it relies on) and starts the dependent at
once, and where systemd does not run, podman runs no health check on its
own (it schedules them with systemd timers), so a container stays
`starting` for ever. Here each condition is checked the way compose defines
it:

  service_started                 the dependency was started
  service_healthy                 its health check passes, run here with
                                  `podman healthcheck run` (which also
                                  records the status podman shows)
  service_completed_successfully  it exited with status 0

Once all are started it waits, as `up --wait` would, for every service with
a health check to pass it and every one-shot (restart "no") to finish. A
one-shot that exits non-zero, or the deadline passing, fails the start with
the service's last log lines.

    compose-start.py COMPOSE_FILE PROJECT TIMEOUT_SECS SERVICE...

PODMAN (podman) and PODMAN_ARGS (its global flags, split on spaces) say how
to call podman.
"""

import os
import shlex
import subprocess
import sys
import time

import yaml

PODMAN = [os.environ.get("PODMAN", "podman"), *shlex.split(os.environ.get("PODMAN_ARGS", ""))]


def say(message):
    print(f"compose: {message}", flush=True)


def podman(*args, check=True):
    return subprocess.run(
        [*PODMAN, *args], check=check, capture_output=True, text=True
    )


def dependencies(service):
    """The service's depends_on as {dependency: condition}."""
    depends_on = service.get("depends_on") or {}
    if isinstance(depends_on, list):
        return {name: "service_started" for name in depends_on}
    return {
        name: (spec or {}).get("condition", "service_started")
        for name, spec in depends_on.items()
    }


def containers(project):
    """{service: container name} of the project's containers."""
    out = podman(
        "ps", "-a", "--filter", f"label=io.podman.compose.project={project}",
        "--format", '{{.Names}}\t{{index .Labels "com.docker.compose.service"}}',
    ).stdout
    found = {}
    for line in out.splitlines():
        name, _, service = line.partition("\t")
        found[service] = name
    return found


def state(container):
    """(status, exit code) of a container."""
    out = podman(
        "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", container
    ).stdout.split()
    return out[0], int(out[1])


def tail(container, lines=40):
    logs = podman("logs", "--tail", str(lines), container, check=False)
    return (logs.stdout + logs.stderr).rstrip()


def main():
    compose_file, project, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    wanted = sys.argv[4:]
    with open(compose_file) as f:
        services = yaml.safe_load(f)["services"]
    needs = {name: dependencies(services[name]) for name in wanted}
    for name, deps in needs.items():
        missing = [d for d in deps if d not in needs]
        if missing:
            sys.exit(f"compose-start: {name} depends on {missing}, which are not started")
    names = containers(project)
    absent = [s for s in wanted if s not in names]
    if absent:
        sys.exit(f"compose-start: no container for {absent} in project {project}")

    started_at = time.monotonic()
    deadline = started_at + timeout
    started = set()
    healthy = set()
    completed = set()

    def failed(service, why):
        print(tail(names[service]), file=sys.stderr)
        sys.exit(f"compose-start: {service} {why}")

    def met(dependency, condition):
        if dependency not in started:
            return False
        if condition == "service_started":
            return True
        if condition == "service_healthy":
            if dependency in healthy:
                return True
            # Not running: its restart policy may start it again; the
            # deadline ends the wait otherwise.
            if state(names[dependency])[0] != "running":
                return False
            if podman("healthcheck", "run", names[dependency], check=False).returncode == 0:
                healthy.add(dependency)
                say(f"{dependency} healthy after {time.monotonic() - started_at:.0f} s")
                return True
            return False
        if condition == "service_completed_successfully":
            if dependency in completed:
                return True
            status, code = state(names[dependency])
            if status in ("exited", "stopped"):
                if code != 0:
                    failed(dependency, f"exited with status {code}")
                completed.add(dependency)
                say(f"{dependency} completed after {time.monotonic() - started_at:.0f} s")
                return True
            return False
        sys.exit(f"compose-start: unknown condition {condition} on {dependency}")

    while len(started) < len(wanted):
        progress = False
        for service in wanted:
            if service in started:
                continue
            if all(met(d, c) for d, c in needs[service].items()):
                result = podman("start", names[service], check=False)
                if result.returncode != 0:
                    sys.exit(f"compose-start: podman start {names[service]}: {result.stderr.strip()}")
                started.add(service)
                progress = True
                say(f"started {service}")
        if progress:
            continue
        if time.monotonic() > deadline:
            waiting = {
                s: [d for d, c in needs[s].items() if not met(d, c)]
                for s in wanted
                if s not in started
            }
            # A condition met while this was asked starts its dependents
            # on the next round.
            waiting = {s: deps for s, deps in waiting.items() if deps}
            if waiting:
                sys.exit(f"compose-start: not started after {timeout:.0f} s, waiting on: {waiting}")
            continue
        time.sleep(1)

    # Then every service is what compose would wait for: healthy where it
    # has a health check, done where it runs once.
    while True:
        pending = []
        for service in wanted:
            if "healthcheck" in services[service]:
                if not met(service, "service_healthy"):
                    pending.append(service)
            elif services[service].get("restart") == "no":
                if not met(service, "service_completed_successfully"):
                    pending.append(service)
        if not pending:
            say(f"all {len(wanted)} services up in {time.monotonic() - started_at:.0f} s")
            return
        if time.monotonic() > deadline:
            for service in pending:
                print(f"--- {service} ---\n{tail(names[service])}", file=sys.stderr)
            sys.exit(f"compose-start: not healthy or done after {timeout:.0f} s: {pending}")
        time.sleep(1)


if __name__ == "__main__":
    main()
