# The manager image: the static musl binary and nothing else, for linux/amd64 and
# linux/arm64 from this one file (the build's TARGETARCH picks the binary).
# Build the binaries first (no network is needed inside the build):
#   cargo build --release          # x86_64-unknown-linux-musl, see .cargo/config.toml
#   scripts/build-arm64            # aarch64-unknown-linux-musl, cross-built with zig
#   scripts/image                  # both platforms, one OCI image index: target/image/
# or one platform by hand (buildah needs --platform to set TARGETARCH; docker sets it):
#   buildah bud --platform linux/amd64 -t ghcr.io/autonomic-sh/autonomic-manager:0.1.0 .
ARG TARGETARCH=amd64

FROM scratch AS amd64
COPY target/x86_64-unknown-linux-musl/release/autonomic-manager /autonomic-manager

FROM scratch AS arm64
COPY target/aarch64-unknown-linux-musl/release/autonomic-manager /autonomic-manager

FROM ${TARGETARCH}
# scripts/image passes the version (Cargo.toml) and the git commit.
ARG VERSION=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="autonomic-manager" \
      org.opencontainers.image.description="In-cluster Kubernetes operator of the autonomic.sh platform" \
      org.opencontainers.image.source="https://github.com/autonomic-sh/autonomic-manager" \
      org.opencontainers.image.url="https://autonomic.sh" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
# Numeric, so runAsNonRoot can verify it without an /etc/passwd.
USER 65532:65532
EXPOSE 8081
ENTRYPOINT ["/autonomic-manager"]
