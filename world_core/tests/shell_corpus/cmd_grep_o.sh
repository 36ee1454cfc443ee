echo 'a1 b22 c333' | grep -o '[0-9]*'
