# The manager image: the static musl binary and nothing else.
# Build the binary first (no network is needed inside the build):
#   cargo build --release          # target x86_64-unknown-linux-musl, see .cargo/config.toml
#   buildah bud -t ghcr.io/autonomic-sh/autonomic-manager:0.1.0 .   # or docker build
FROM scratch
COPY target/x86_64-unknown-linux-musl/release/autonomic-manager /autonomic-manager
# Numeric, so runAsNonRoot can verify it without an /etc/passwd.
USER 65532:65532
EXPOSE 8081
ENTRYPOINT ["/autonomic-manager"]
