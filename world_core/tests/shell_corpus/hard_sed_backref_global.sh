echo 'key1=val1;key2=val2' | sed -E 's/([a-z0-9]+)=([a-z0-9]+)/\2=\1/g'
