// Format canary (deliberately misformatted, NOT a weightsync source): scripts/ci_static.sh
// REQUIRES that the format check flags this file, which proves the check can fail.
int  main( ){return  0 ;}
