echo 'hello world' | sed 's/world/there/'
