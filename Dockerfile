# Builds lockd into a small Debian image. Used by docker-compose.yml.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# jemalloc's settings (its background thread returns freed memory).
COPY .cargo .cargo
COPY src src
# Cargo.toml keeps line tables in release builds (for profiling local
# builds); the image's binary needs none: strip it (77 MB -> 11 MB).
RUN cargo build --release --locked --bin lockd \
 && strip target/release/lockd

FROM debian:bookworm-slim
# The system's root certificates: a rediss:// server (a managed Redis) is
# verified against them unless --redis-ca-cert is given.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 10001 --no-create-home lockd
COPY --from=build /src/target/release/lockd /usr/local/bin/lockd
USER lockd
# Inside a container lockd must listen on all interfaces to be reachable, so
# it refuses to start without API keys: mount a keys file and set
# LOCKD_AUTH_KEYS_FILE (see `lockd keygen`), or, for development only, set
# LOCKD_INSECURE_NO_AUTH=true (docker-compose.yml does, on loopback).
ENV LOCKD_LISTEN=0.0.0.0:8080
EXPOSE 8080
ENTRYPOINT ["lockd"]
CMD ["serve"]
