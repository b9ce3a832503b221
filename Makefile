# tidelog: `make demo` and `make test` set everything up themselves on a fresh Debian machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install debs interop test demo lint bench clean

NATIVE       := $(VENV)/.native
NATIVE_SRCS  := $(wildcard src/tidelog/protocol/*.c src/tidelog/protocol/records/*.c)
# make's installs compile the C accelerators or fail (a plain pip install falls back to Python).
export TIDELOG_REQUIRE_NATIVE := 1

install: debs $(STAMP) $(NATIVE)

# The virtualenv is rebuilt only when pyproject.toml or setup.py changes.
$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP) $(NATIVE)

# The C accelerators are rebuilt in place when their sources change.
$(NATIVE): $(STAMP) $(NATIVE_SRCS)
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(NATIVE)

debs:
	@PYTHON=$(PYTHON) bash scripts/install-debs.sh

# Apache Kafka 3.9 (broker, tools, Java clients) for the compatibility tests, from Maven Central
# once (interop/pom.xml pins it), offline from the local Maven repository afterwards; and the
# Java clients' harness compiled against them.
INTEROP      := interop/target/lib/.fetched
INTEROP_SRCS := $(wildcard interop/src/main/java/tidelog/interop/*.java)
KAFKAJS      := interop/kafkajs/node_modules/.installed
MVN_INTEROP  := mvn -B -q compile dependency:copy-dependencies -DoutputDirectory=target/lib -DincludeScope=runtime
interop: debs $(INTEROP) $(KAFKAJS)

$(INTEROP): interop/pom.xml $(INTEROP_SRCS)
	cd interop && rm -rf target/lib && { $(MVN_INTEROP) -o >/dev/null 2>&1 || $(MVN_INTEROP); }
	touch $(INTEROP)

# KafkaJS for tests/compat/test_kafkajs.py, exactly as its package-lock.json pins it; from npm's
# cache once it has been fetched.
$(KAFKAJS): interop/kafkajs/package.json interop/kafkajs/package-lock.json
	npm ci --prefix interop/kafkajs --prefer-offline --no-audit --no-fund
	touch $(KAFKAJS)

test: install interop
	@bash scripts/run-tests.sh

# The main job: a live 3-broker cluster surviving a leader kill -9, then the Spark clickstream
# pipeline on a fresh cluster (its counts must equal the counts of the acknowledged events), once
# with tidelog's connector and once, unchanged, with Spark's own Kafka connector (fetched once).
demo: install
	$(VENV)/bin/tidelog demo
	$(PY) examples/clickstream.py
	$(PY) examples/clickstream.py --connector kafka

lint: install
	$(VENV)/bin/ruff check src tests bench tools examples

bench: install
	$(PY) bench/storage.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
	find src -name '*.so' -delete
