# The two set-up commands of the README, and what they need on a fresh Debian machine.
#   make demo   - the main job: the whole tour on the SIMULATED 4-node ring
#   make test   - lint and types (`make lint`: ruff, mypy), then the test suite (unit tests +
#                 end-to-end tests on the simulated cluster)
PY ?= python3
# systemd, netplan.io, shellcheck: the real tools that judge the rendered units, netplan
# files and scripts (tests/test_real_tools.py; PID 1 is not needed); iptables: the simulated
# node's Docker firewall rules, in the node's own network namespace. prometheus (with promtool)
# and chromium: the real scraper and browser that judge the node exporters and the head's
# status page (tests/sim/test_simulated_ring_observability.py).
APT_PACKAGES = openssh-server openssh-client iproute2 iputils-ping procps psmisc curl ethtool \
  systemd netplan.io shellcheck iptables earlyoom prometheus chromium

.PHONY: setup demo lint test

setup:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  fi; \
	else echo "not root: skipping Debian packages ($(APT_PACKAGES)); the simulated cluster runs in its degraded rootless mode"; fi
	$(PY) -m pip install -q -e '.[test,sim,plots]'

demo: setup
	sparkctl demo

# ruff (pycodestyle, pyflakes, isort) and mypy, configured in pyproject.toml; before the tests, so
# a lint failure costs seconds, not the suite's minutes. `ruff check --fix` repairs import order.
lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy

test: setup lint
	$(PY) -m pytest -q
