echo *.nothing
