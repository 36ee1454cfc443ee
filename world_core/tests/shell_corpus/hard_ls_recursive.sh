mkdir -p r/s
touch r/a r/s/b
ls -R r
