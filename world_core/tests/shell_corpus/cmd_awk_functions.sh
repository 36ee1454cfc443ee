echo 'Hello World' | awk '{print toupper($1), length($2), substr($2, 2, 3)}'
