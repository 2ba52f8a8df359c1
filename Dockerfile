# lockd's image: the static binary (x86_64-unknown-linux-musl, built by
# scripts/package.sh static, as outside Docker) on an empty base, run as a
# numeric non-root user. Used by docker-compose.yml; docs/deploy.md tells how
# to run it.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# jemalloc's settings (its background thread returns freed memory).
COPY .cargo .cargo
COPY src src
COPY scripts/package.sh scripts/ensure-deps.sh scripts/
# Adds rustup's musl target and Debian's musl-tools (musl-gcc, for the C of
# jemalloc and ring), builds, strips (the release profile keeps line tables:
# 100 MB -> 15 MB) and writes target/dist/lockd-VERSION-x86_64-unknown-linux-musl.
RUN scripts/package.sh static \
 && cp target/dist/lockd-*-x86_64-unknown-linux-musl /lockd

# scratch: the image holds lockd and the root certificates, nothing else: no
# shell, no package manager, no libc (the binary is static), so nothing to
# patch but lockd itself. The certificates verify a rediss:// server (a
# managed Redis) unless --redis-ca-cert is given.
FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /lockd /usr/bin/lockd
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
# A numeric user and group, which need no /etc/passwd (65532, as distroless's
# "nonroot"); lockd writes no file and its default port is above 1024.
USER 65532:65532
# Inside a container lockd must listen on all interfaces to be reachable, so
# it refuses to start without API keys: mount a keys file and set
# LOCKD_AUTH_KEYS_FILE (see `lockd keygen`), or, for development only, set
# LOCKD_INSECURE_NO_AUTH=true (docker-compose.yml does, on loopback).
ENV LOCKD_LISTEN=0.0.0.0:8080
EXPOSE 8080
ENTRYPOINT ["/usr/bin/lockd"]
CMD ["serve"]
