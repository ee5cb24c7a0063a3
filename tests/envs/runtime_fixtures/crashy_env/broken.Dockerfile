FROM envhub/base
RUN echo "deliberately broken image" && exit 3
