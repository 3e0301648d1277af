"""The image: the Dockerfile, build.sh, its lock, and the image run as the chart runs it."""
