echo 'a:b:c:d' | cut -d: -f2
echo 'a:b:c:d' | cut -d: -f1,3
echo 'a:b:c:d' | cut -d: -f2-
