# Sourced by the shell tests that start ranks by hand: a TCP port nothing listens on, for
# MASTER_PORT. Reads /proc/net/tcp{,6}; a port may still be taken between the check and its use,
# so callers keep their own timeouts.

# Whether something listens on port $1.
listening() { grep -qi ":$(printf '%04X' "$1") [0-9A-F:]* 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null; }

# Prints a port in [30000, 50000) nothing listens on; returns 1 after 50 tries.
free_port() {
  local candidate
  for _ in $(seq 1 50); do
    candidate=$(( 30000 + RANDOM % 20000 ))
    if ! listening "$candidate"; then echo "$candidate"; return 0; fi
  done
  return 1
}
