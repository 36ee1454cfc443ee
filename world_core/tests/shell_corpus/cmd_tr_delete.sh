echo 'h-e-l-l-o' | tr -d '-'
